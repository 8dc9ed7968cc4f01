# The image of the simrun service (`simrun server` with the kubernetes executor and BuildKit's client), built from
# the repository root:
#   docker build -f deploy/server.Dockerfile -t localhost:30500/simrun/server:0.1.0 .
# BASE is any Debian-based Python 3.11 image (the tests build it from a debootstrap base with buildah); behind a
# TLS-intercepting proxy, mount its CA bundle into the build and name it with CA_BUNDLE (nothing of it is kept).
ARG BASE=docker.io/library/python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16
ARG BUILDKIT=docker.io/moby/buildkit:v0.23.2
FROM ${BUILDKIT} AS buildkit

FROM ${BASE}
ARG CA_BUNDLE=""
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PROJECT_ENVIRONMENT=/opt/simrun/.venv UV_PYTHON_DOWNLOADS=never \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
COPY --from=buildkit /usr/bin/buildctl /usr/local/bin/buildctl
WORKDIR /opt/simrun/src
COPY . .
# uv in a venv of its own: a Debian base has no pip and refuses installs into its Python (PEP 668).
RUN if [ -n "$CA_BUNDLE" ]; then export SSL_CERT_FILE="$CA_BUNDLE" PIP_CERT="$CA_BUNDLE"; fi \
    && python3 -m venv /opt/uv && /opt/uv/bin/pip install --quiet uv==0.13.9 \
    && ln -s /opt/uv/bin/uv /usr/local/bin/uv \
    && uv sync --locked --no-dev --all-packages --extra kubernetes --python python3 --no-cache \
    && useradd --uid 1000 --create-home simrun
ENV PATH=/opt/simrun/.venv/bin:$PATH
USER 1000
ENTRYPOINT ["simrun"]
CMD ["server", "--config", "/etc/simrun/server.yaml"]
