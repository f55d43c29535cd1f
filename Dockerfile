# Small, non-root image of seb with every bus installed.
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bridge bridge
COPY sinks sinks
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[all]'

FROM python:3.12-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/seb --create-home seb
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER seb
ENV SEB_STATE_DIR=/var/lib/seb SEB_LISTEN=0.0.0.0:9464
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:9464/healthz').status != 200)"
ENTRYPOINT []
CMD ["seb", "run"]
