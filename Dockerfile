# The streamtx server, built from this repository alone.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY streamtx streamtx
COPY server server
COPY client client
COPY recovery recovery
COPY procedures procedures
COPY bench bench
COPY protos protos
RUN pip install --no-cache-dir . && useradd --create-home streamtx && mkdir /data && chown streamtx /data
USER streamtx
VOLUME /data
EXPOSE 7411
ENTRYPOINT ["streamtx"]
CMD ["serve", "--host", "0.0.0.0", "--port", "7411", "--data-dir", "/data"]
