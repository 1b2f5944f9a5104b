# redis-lock-proxy container image.
#
#   docker build -t redis-lock-proxy .
#   (behind a TLS-inspecting proxy: --secret id=extra-ca,src=corporate-ca.pem)
#   docker run --rm -p 127.0.0.1:6380:6380 -p 127.0.0.1:9180:9180 \
#     -e REDIS_LOCK_PROXY_UPSTREAM=redis://redis.example:6379 redis-lock-proxy
#
# Two stages on the same base: "build" installs every dependency and compiles
# src/ to dist/ with tsc; the runtime stage installs production dependencies
# only (no TypeScript, no test tools) and takes dist/ from the build stage.
#
# Base image: one place for both stages. To pin by digest (recommended for
# production builds), look the digest up with
#   docker buildx imagetools inspect node:24-bookworm-slim
# and build with
#   --build-arg NODE_IMAGE=node:24-bookworm-slim@sha256:<digest>
# or change the default below to that reference. Where no registry answers,
# .ci/node-base-image.sh builds this base from Debian packages and Node from the
# npm registry (docs/running.md#the-base-image-and-building-where-no-registry-answers).
ARG NODE_IMAGE=node:24-bookworm-slim

# ---------------------------------------------------------------- build stage
FROM ${NODE_IMAGE} AS build
WORKDIR /app

# Dependencies first, so this layer is reused while only sources change.
# --ignore-scripts: `prepare` (the tsc build) cannot run before src/ is here;
# the build runs explicitly below.
# Behind a TLS-inspecting proxy, npm must trust the proxy's CA: give it as the
# build secret "extra-ca" (`--secret id=extra-ca,src=corporate-ca.pem`). A secret
# is mounted for this one RUN only and never stored in a layer; without it the
# file is absent and npm trusts Node's own CAs.
COPY package.json package-lock.json ./
RUN --mount=type=secret,id=extra-ca \
    if [ -s /run/secrets/extra-ca ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/extra-ca; fi \
    && npm ci --ignore-scripts --no-audit --no-fund

COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build

# -------------------------------------------------------------- runtime stage
FROM ${NODE_IMAGE}

ARG NODE_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="redis-lock-proxy" \
      org.opencontainers.image.description="Transparent RESP proxy in front of Redis that applies lock expiries only when the lock is created (fixes the abandoned locks of Stalwart 0.8.1-0.16.15)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${NODE_IMAGE}"

ENV NODE_ENV=production \
    NPM_CONFIG_UPDATE_NOTIFIER=false

WORKDIR /app

# Production dependencies only. --ignore-scripts: `prepare` must not run here
# (no tsc in this stage). The one dependency with an install script, the
# optional unix-dgram (systemd's readiness notification on a host), is not
# built: nothing in a container sets NOTIFY_SOCKET, and the proxy loads it only
# then.
# Everything stays owned by root, so the unprivileged user below can read but
# not change the application.
# Also in this layer:
# - /app/rules/stalwart points at the baked rules, so the CLI's built-in
#   default (rules/stalwart/ next to dist/) finds the same files even when
#   REDIS_LOCK_PROXY_RULES is unset;
# - `redis-lock-proxy` on PATH, for `docker exec ... redis-lock-proxy locks`
#   and exec probes (`redis-lock-proxy verify --via 127.0.0.1:6380`).
# The extra CA as in the build stage: for this RUN only, never in the image.
COPY package.json package-lock.json ./
RUN --mount=type=secret,id=extra-ca \
    if [ -s /run/secrets/extra-ca ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/extra-ca; fi \
    && npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
    && npm cache clean --force \
    && rm -rf /root/.npm /tmp/* \
    && mkdir /app/rules && ln -s /etc/redis-lock-proxy/rules /app/rules/stalwart \
    && printf '#!/bin/sh\nexec node /app/dist/cli.js "$@"\n' >/usr/local/bin/redis-lock-proxy \
    && chmod 0755 /usr/local/bin/redis-lock-proxy

COPY --from=build /app/dist ./dist

# The shipped rules: one file per affected Stalwart release line, 0.8.1 to
# 0.16.15 (REDIS_LOCK_PROXY_STALWART=0.15.3 keeps one release's). To use
# other rules, mount a directory of *.yaml files over
# /etc/redis-lock-proxy/rules (a Kubernetes ConfigMap works), or point
# REDIS_LOCK_PROXY_RULES / --rules elsewhere.
COPY rules/stalwart /etc/redis-lock-proxy/rules

# In-container defaults: listen on every interface of the container (the
# CLI's own defaults stay loopback-only on a host), so that port mappings and
# an orchestrator's probes reach the ports. The admin port has no
# authentication: publish it only to the host's loopback (-p
# 127.0.0.1:9180:9180) or to Prometheus (a NetworkPolicy in Kubernetes), or
# set REDIS_LOCK_PROXY_ADMIN_LISTEN=127.0.0.1:9180 when nothing outside the
# container needs it (the HEALTHCHECK below follows it). Set the upstream with
# REDIS_LOCK_PROXY_UPSTREAM or --upstream; the built-in default
# redis://127.0.0.1:6379 only fits `--network host` or a shared network
# namespace with Redis.
ENV REDIS_LOCK_PROXY_LISTEN=0.0.0.0:6380 \
    REDIS_LOCK_PROXY_ADMIN_LISTEN=0.0.0.0:9180 \
    REDIS_LOCK_PROXY_RULES=/etc/redis-lock-proxy/rules

# 6380: RESP (clients), 9180: admin HTTP (/metrics, /healthz, /readyz).
EXPOSE 6380 9180

# The image's `node` user (uid/gid 1000), given numerically so that
# Kubernetes' runAsNonRoot can verify it without a runAsUser.
USER 1000:1000

# Liveness: GET /healthz on the admin listener, found through
# REDIS_LOCK_PROXY_ADMIN_LISTEN (a wildcard address is asked on loopback).
# With the admin listener `off` it checks instead that the RESP port accepts a
# TCP connection. If you move the admin port with the --admin-listen flag
# rather than the environment variable, override this HEALTHCHECK too.
# Node's global fetch: slim images have no curl or wget.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["node", "-e", "const s=process.env.REDIS_LOCK_PROXY_ADMIN_LISTEN||'0.0.0.0:9180';const a=s==='off'?process.env.REDIS_LOCK_PROXY_LISTEN||'0.0.0.0:6380':s;const i=a.lastIndexOf(':');let h=i<0?'':a.slice(0,i);const p=Number(a.slice(i+1));if(['','0.0.0.0','::','[::]'].includes(h))h='127.0.0.1';const fail=()=>process.exit(1);setTimeout(fail,4000);if(s==='off'){require('node:net').connect(p,h.replace(/^\\[|\\]$/g,''),()=>process.exit(0)).on('error',fail);}else{fetch('http://'+h+':'+p+'/healthz').then(r=>process.exit(r.ok?0:1),fail);}"]

# SIGTERM: stop accepting, let in-flight lock blocks finish, close within
# --shutdown-timeout-ms. Keep that below the orchestrator's grace period
# (docker stop: 10 s by default; Kubernetes: terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM

ENTRYPOINT ["node", "/app/dist/cli.js"]
