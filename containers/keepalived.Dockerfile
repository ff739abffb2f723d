# The image keepalived runs from on the ingress hosts (router.virtual_ip; the inventory's
# router.keepalived_image, default pdboot/keepalived:2.2.7): Debian 12's keepalived 2.2.7 and
# busybox, whose wget is the track script's probe of the local proxy (plan/ingress.py).
# Build from the repository root and push where the ingress hosts pull from:
#   docker build -f containers/keepalived.Dockerfile -t REGISTRY/pdboot/keepalived:2.2.7 .
# and set router.keepalived_image to that reference. The testbed builds the same from the
# Debian packages (tests/testbed/images.py).
FROM debian:12-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends keepalived=1:2.2.7-1+b2 busybox \
    && rm -rf /var/lib/apt/lists/*
# runs as root: VRRP adds the address and sends raw packets (NET_ADMIN, NET_RAW,
# NET_BROADCAST are the only capabilities compose grants it)
ENTRYPOINT ["/usr/sbin/keepalived", "--dont-fork", "--log-console", "--vrrp"]
