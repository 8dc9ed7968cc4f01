# The image of the simrun service (`simrun server` with the kubernetes executor), built from the repository root:
#   docker build -f deploy/server.Dockerfile -t localhost:30500/simrun/server:0.1.0 .
FROM python:3.11-slim
RUN pip install --no-cache-dir uv==0.13.9
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PROJECT_ENVIRONMENT=/opt/simrun/.venv
WORKDIR /opt/simrun/src
COPY . .
RUN uv sync --locked --no-dev --all-packages --extra kubernetes && useradd --uid 1000 --create-home simrun
ENV PATH=/opt/simrun/.venv/bin:$PATH
USER 1000
ENTRYPOINT ["simrun"]
CMD ["server", "--config", "/etc/simrun/server.yaml"]
