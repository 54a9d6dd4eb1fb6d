#!/usr/bin/env bash
# Type-check dashboards/mpib.json against Grafana's published dashboard schema
# (npm @grafana/schema + typescript; no Grafana server is needed or installable here).
# Needs Node.js (node and npm) and the npm registry. Not part of scripts/test; run it after editing the
# dashboard:  dashboards/schema/check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work="${MPIB_SCHEMA_WORKDIR:-${TMPDIR:-/tmp}/mpib-grafana-schema}"
mkdir -p "$work"
if [ ! -d "$work/node_modules/@grafana/schema" ] || [ ! -d "$work/node_modules/typescript" ]; then
    echo "==> npm install typescript@5 @grafana/schema@13.2.3 (into $work)"
    (cd "$work" && { [ -f package.json ] || npm init -y >/dev/null; } \
        && npm install --no-audit --no-fund --silent typescript@5 @grafana/schema@13.2.3)
fi
python3 dashboards/schema/gen_check.py dashboards/mpib.json "$work/check.ts"
cat > "$work/tsconfig.json" <<'JSON'
{
  "compilerOptions": {
    "strict": true,
    "noEmit": true,
    "module": "NodeNext",
    "moduleResolution": "NodeNext",
    "target": "ES2022",
    "skipLibCheck": true
  },
  "files": ["check.ts"]
}
JSON
echo "==> tsc: dashboards/mpib.json against @grafana/schema Dashboard"
(cd "$work" && npx --no-install tsc -p .)
echo "dashboards/mpib.json: schema OK"
