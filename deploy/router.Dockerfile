# The router image for router.yaml: the same pinned wheels the CI router check installs
# (xtask/src/test.rs). Not built in CI.
#   docker build -f deploy/router.Dockerfile -t tandem-router:latest deploy/
FROM python:3.12-slim
RUN pip install --no-cache-dir vllm-router==0.1.17 sglang-router==0.3.2
EXPOSE 30000 29000
