# latentgate CPU image: serving dependencies only (no torch, no compiler), non-root, HEALTHCHECK.
# Build: docker build -t latentgate:0.1.0 .   (no container engine runs on the dev/CI machines:
# CI lints this file with hadolint and runs the same scripts/install.sh steps through `make install`).
# TORCH_INDEX_URL: optional wheel index for the build stage's torch (a CPU-only index keeps the
# throwaway build stage small; torch never reaches the final image either way).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Stage 1: model artifacts. torch exports the packaged MiniLM to ONNX, named by weight hash
# where the serving side's resolver looks (LATENTGATE_ARTIFACTS), checked against
# sentence-transformers.
FROM ${PYTHON_IMAGE} AS models
ARG TORCH_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scripts/ scripts/
COPY gateway/ gateway/
COPY cache/ cache/
COPY backends/ backends/
RUN python -m venv /opt/build \
    && TORCH_INDEX_URL="${TORCH_INDEX_URL}" sh scripts/install.sh /opt/build/bin/python build \
    && /opt/build/bin/python scripts/export_minilm.py /opt/models

# Stage 2: the serving virtualenv, installed by the same script `make install` runs.
FROM ${PYTHON_IMAGE} AS serve
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scripts/ scripts/
COPY gateway/ gateway/
COPY cache/ cache/
COPY backends/ backends/
RUN python -m venv /opt/venv && sh scripts/install.sh /opt/venv/bin/python serve

# Final stage: the venv, the ONNX artifacts and the default config; nothing else.
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 latentgate \
    && useradd --system --uid 10001 --gid latentgate --no-create-home \
       --shell /usr/sbin/nologin latentgate \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/latentgate
COPY --from=serve /opt/venv /opt/venv
COPY --from=models /opt/models /opt/latentgate/models
COPY config/latentgate.yaml /etc/latentgate/latentgate.yaml
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    LATENTGATE_CONFIG=/etc/latentgate/latentgate.yaml \
    LATENTGATE_HOST=0.0.0.0 \
    LATENTGATE_ARTIFACTS=/opt/latentgate/models \
    LATENTGATE_STATE_DIR=/var/lib/latentgate
USER 10001:10001
EXPOSE 8080
STOPSIGNAL SIGTERM
# The slim base has no curl: the probe is the interpreter that is already there.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["latentgate"]
CMD ["serve"]
