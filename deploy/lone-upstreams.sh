#!/usr/bin/env bash
# Keep nginx's `lone_replicas` servers to the replicas that are up: poll each one's GET /health
# (200: serving; 503: still loading; no answer: gone), write the server lines to
# $LONE_UPSTREAM_FILE, and reload nginx when they change. Open-source nginx has no active
# health checks; this is the usual stand-in. See docs/deploy.md.
#
#   LONE_REPLICAS="127.0.0.1:8081 127.0.0.1:8082" deploy/lone-upstreams.sh          # loop
#   LONE_REPLICAS=... deploy/lone-upstreams.sh --once                                # one pass
#
# LONE_UPSTREAM_FILE   default /etc/nginx/lone-upstream.conf
# LONE_NGINX_RELOAD    default "nginx -s reload"
# LONE_HEALTH_INTERVAL seconds between passes, default 1
set -uo pipefail
file=${LONE_UPSTREAM_FILE:-/etc/nginx/lone-upstream.conf}
reload=${LONE_NGINX_RELOAD:-nginx -s reload}
interval=${LONE_HEALTH_INTERVAL:-1}
replicas=${LONE_REPLICAS:?set LONE_REPLICAS to the replicas host:port list}

render() {
  for r in $replicas; do
    if curl -fsS -o /dev/null -m 1 "http://$r/health" 2>/dev/null; then
      echo "server $r max_fails=1 fail_timeout=3s;"
    else
      echo "server $r down;"
    fi
  done
}

pass() {
  local new
  new=$(render)
  if [ ! -f "$file" ] || [ "$new" != "$(cat "$file")" ]; then
    printf '%s\n' "$new" > "$file.tmp" && mv "$file.tmp" "$file"
    echo "lone-upstreams: $(echo "$new" | grep -c ' down;') of $(echo "$new" | wc -l) down: $(echo "$new" | grep ' down;' | awk '{print $2}' | tr '\n' ' ')" >&2
    return 0
  fi
  return 1
}

if [ "${1:-}" = "--once" ]; then
  pass || true
  exit 0
fi
while true; do
  if pass; then
    $reload || echo "lone-upstreams: reload failed" >&2
  fi
  sleep "$interval"
done
