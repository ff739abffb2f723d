# The image `up` and `pdboot stage` fetch the weights with (an inventory's `weights.image`):
# Python and huggingface_hub only, a few tens of MB, so that staging starts seconds after
# preflight while the engine image (~10-20 GB) still pulls. Build from the repository root
# and push where the engine hosts pull from:
#   docker build -f containers/stage.Dockerfile -t REGISTRY/pdboot-stage:VERSION . && docker push REGISTRY/pdboot-stage:VERSION
# The programs it runs come from pdboot at run time (weights/script.py, python3 -c): the
# image holds no pdboot code and no secrets (the HF token arrives as a file the program
# removes at once). Root, as the engines that read the cache it writes.
FROM python:3.11-slim
RUN pip install --no-cache-dir "huggingface_hub==2.4.0"
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["python3"]
