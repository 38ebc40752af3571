"""Run mediasrv the way the owner deploys it: nginx in front, N `mediasrv serve` processes behind.

    mediasrv sidecar --host 0.0.0.0 --port 80 [--workers N]

The environment is the one of `mediasrv serve` (MEDIASRV_*), plus MEDIASRV_WORKERS (the number
of mediasrv processes, default: the number of cores); --host and --port default to
MEDIASRV_HOST and MEDIASRV_PORT. Each process listens on a free loopback port; nginx (Debian
package `nginx`, on PATH or in /usr/sbin) listens on --host:--port with the packaged
mediasrv/deploy/nginx/mediasrv.conf.template rendered into a temporary directory (pid, temp
files, cache and configuration live there; nothing under /etc/nginx is read or written). The
processes get MEDIASRV_TRUST_PROXY=true and MEDIASRV_PUBLIC_URL=http://HOST:PORT unless set
(behind nginx the public URL is nginx's address, not a process's). At start the descriptor
limit is raised to 65536, or to what the machine allows (with a warning).

It stays in the foreground. SIGTERM or SIGINT: nginx stops accepting and finishes what is in
flight (at most 8 s), then every mediasrv process drains and exits; exit status 0, well within
20 s. A mediasrv process that dies is started again on its port (nginx answers 502 JSON for it
meanwhile). If nginx's master dies, its orphaned workers (which keep the port) are killed and
reaped (``orphans``: the sidecar is their child subreaper) and nginx is started again once the
port is free; more than 5 times in a minute, everything stops and the exit status is 1.

Passthrough /m and /d are sent by nginx (MEDIASRV_ACCEL_REDIRECT=/_blobs/ unless set): blob
files from disk with sendfile, S3 objects (MEDIASRV_S3_BUCKET) by an internal proxy_pass to a
presigned GET URL, after mediasrv did auth, limits, privacy, 304/416 and counting. nginx
resolves the S3 endpoint's host name with MEDIASRV_NGINX_RESOLVER (addresses), else the first
nameserver of /etc/resolv.conf, and checks its certificate against AWS_CA_BUNDLE or the
system's CA bundle.

Several processes on one SQLite DATA_DIR are safe: SQLite in WAL mode serialises writers
across processes (each write waits for the lock up to 5 s), every counter write is an
increment or a conditional UPDATE, and the sweep only touches blobs and temp files older than
MEDIASRV_SWEEP_GRACE. Housekeeping has one owner: `mediasrv reconcile` runs once before the
processes start (embedded SQLite; counters exact after a crash), then the first process gets
MEDIASRV_HOUSEKEEPING=sweep (the periodic sweep) and the others none, also when one is started
again, so a restart never recomputes counters under another process's uploads in flight and
sweeps never race (MEDIASRV_HOUSEKEEPING=none given to the sidecar: no reconcile, no process
sweeps). Per-user limits (uploads 30/min per user...) are counted per process, so a user
spread over several client addresses can get up to N times them; per-address limits are exact
because nginx sends one address to one process (`hash $remote_addr consistent`). Behind a load
balancer, MEDIASRV_NGINX_REAL_IP_FROM names its addresses (or networks): nginx then takes the
client address from the X-Forwarded-For they set (its realip module), so the hash, the /m
counter and mediasrv see the client, not the balancer.

Modules: ``command`` (the two commands), ``nginx_conf`` (the rendering), ``processes`` (start,
watch, stop), ``orphans`` (no nginx worker outlives its master). No event loop: a supervisor
polling its children.

MEDIASRV_METRICS_PORT: the sidecar listens there (MEDIASRV_METRICS_HOST, default 127.0.0.1) for
all its processes, each of which serves its metrics on a Unix socket in the sidecar's private
directory (MEDIASRV_METRICS_SOCKET); one scrape fans in from all of them, each series labelled
worker="<index>" (``mediasrv.web.metrics_fanin``).
"""
