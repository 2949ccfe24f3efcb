#!/bin/sh
# One-shot (temporalio/admin-tools), after the server is healthy: create the
# namespace and register Turnstile's search attributes (the worker would try
# too, but on a real cluster that is an operator's job). Idempotent.
set -eu

: "${TEMPORAL_ADDRESS:=temporal:7233}"
: "${TEMPORAL_NAMESPACE:=default}"
: "${NAMESPACE_RETENTION:=72h}"

tries=0
until temporal operator cluster health --address "$TEMPORAL_ADDRESS"; do
  tries=$((tries + 1))
  if [ "$tries" -ge 30 ]; then
    echo "Temporal at $TEMPORAL_ADDRESS not healthy after $tries tries" >&2
    exit 1
  fi
  sleep 2
done

if ! temporal operator namespace describe --address "$TEMPORAL_ADDRESS" \
     --namespace "$TEMPORAL_NAMESPACE" >/dev/null 2>&1; then
  temporal operator namespace create --address "$TEMPORAL_ADDRESS" \
    --namespace "$TEMPORAL_NAMESPACE" --retention "$NAMESPACE_RETENTION"
fi
# A new namespace takes a moment to reach every server role.
tries=0
until temporal operator search-attribute list --address "$TEMPORAL_ADDRESS" \
      --namespace "$TEMPORAL_NAMESPACE" >/dev/null 2>&1; do
  tries=$((tries + 1))
  [ "$tries" -lt 30 ] || { echo "namespace $TEMPORAL_NAMESPACE not ready" >&2; exit 1; }
  sleep 1
done

# Turnstile's search attributes (turnstile/search_attributes.py):
#   temporal workflow list --query 'TurnstilePendingApprovals > 0'
existing=$(temporal operator search-attribute list --address "$TEMPORAL_ADDRESS" \
  --namespace "$TEMPORAL_NAMESPACE")
for pair in TurnstileStatus:Keyword TurnstilePendingApprovals:Int \
            TurnstileConversation:Keyword TurnstileUser:Keyword TurnstileService:Keyword; do
  name=${pair%%:*}
  type=${pair#*:}
  if echo "$existing" | grep -qw "$name"; then
    echo "search attribute $name exists"
  else
    temporal operator search-attribute create --address "$TEMPORAL_ADDRESS" \
      --namespace "$TEMPORAL_NAMESPACE" --name "$name" --type "$type"
  fi
done
echo "namespace $TEMPORAL_NAMESPACE ready"
