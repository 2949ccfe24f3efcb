# Turnstile worker image: `python worker.py` (see docker-compose.yml for the
# --no-sender / --sender-only split, the SMTP sink and starter.py).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TURNSTILE_DATA_DIR=/data

WORKDIR /app

# Dependencies first (ranges in pyproject.toml, at the versions of
# constraints.txt), so code edits reuse this layer. The image has every
# optional part (the `all` extra: the inbox, PostgreSQL, MCP servers).
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + [r for e in ('inbox', 'postgres', 'mcp') for r in p['optional-dependencies'][e]]))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt -c constraints.txt \
    && rm /tmp/requirements.txt

COPY . .
RUN pip install -c constraints.txt '.[all]' \
    && useradd --create-home --uid 10001 turnstile \
    && mkdir -p /data/mail \
    && chown -R turnstile:turnstile /data

USER turnstile

CMD ["python", "worker.py"]
