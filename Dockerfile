# Images built from this repository alone (docker-compose.yml builds both).
#   target server (the default, last stage): the streamtx server
#   target spark-job: the example Spark pipeline (procedures/voter/spark_pipeline.py)

# ---- the Spark job: Java 17 + PySpark + streamtx's connector -------------------------
FROM python:3.11-slim-bookworm AS spark-job
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY streamtx streamtx
COPY server server
COPY client client
COPY recovery recovery
COPY procedures procedures
COPY bench bench
COPY protos protos
RUN pip install --no-cache-dir -c constraints.txt '.[spark]' && useradd --create-home streamtx && mkdir /work && chown streamtx /work
USER streamtx
WORKDIR /work
ENV PYSPARK_PYTHON=python3
ENTRYPOINT ["python", "-m", "streamtx.procedures.voter.spark_pipeline"]
CMD ["--target", "streamtx:7411", "--input", "/work/votes-raw", "--checkpoint", "/work/checkpoint", "--generate", "20000", "--files", "20", "--once"]

# ---- the server ----------------------------------------------------------------------
FROM python:3.11-slim AS server
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY streamtx streamtx
COPY server server
COPY client client
COPY recovery recovery
COPY procedures procedures
COPY bench bench
COPY protos protos
RUN pip install --no-cache-dir -c constraints.txt . && useradd --create-home streamtx && mkdir /data && chown streamtx /data
USER streamtx
VOLUME /data
EXPOSE 7411
ENTRYPOINT ["streamtx"]
CMD ["serve", "--host", "0.0.0.0", "--port", "7411", "--data-dir", "/data"]
