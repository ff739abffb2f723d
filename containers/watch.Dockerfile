# The image `up` runs `pdboot watch` from when the inventory has `watch: {image: ...}`.
# Build from the repository root and push where the router host pulls from:
#   docker build -f containers/watch.Dockerfile -t REGISTRY/pdboot:VERSION . && docker push REGISTRY/pdboot:VERSION
FROM python:3.11-slim
COPY pyproject.toml README.md /src/
COPY pdboot /src/pdboot
RUN pip install --no-cache-dir /src && rm -rf /src
# no shell, no secrets baked in: the inventory comes read-only from the host, the API key
# from secrets.env (env_file) at run time
USER nobody
ENTRYPOINT ["pdboot"]
