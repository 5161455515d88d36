#!/usr/bin/env bash
# Screenshot of a recording in the Rerun web viewer (rerun-sdk 0.36.3 from tools/venv.sh rerun)
# shown by Chromium on a virtual display (Xvfb), for docs/. The native viewer renders black on
# Xvfb here (Vulkan on llvmpipe without DRI3) and refuses GL (no R32Float render target), so the
# web viewer (WebGL on SwiftShader) it is. Needs: apt-get install xvfb chromium imagemagick
# x11-apps. Usage: tools/rrd_screenshot.sh FILE.rrd OUT.png [WIDTHxHEIGHT] [SECONDS]
set -euo pipefail
rrd=$(realpath "$1")
out=$2
size=${3:-1600x1000}
wait_s=${4:-45}
here=$(cd "$(dirname "$0")" && pwd)
PY=$("$here/venv.sh" rerun)
RERUN="$(dirname "$PY")/rerun"
export RERUN_ANALYTICS=0
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
display=:$((90 + RANDOM % 100))
Xvfb "$display" -screen 0 "${size}x24" > "$tmp/xvfb.log" 2>&1 &
pids+=($!)
grpc=$((20000 + RANDOM % 20000))
web=$((grpc + 1))
# The pip `rerun` is a Python launcher: exec the bundled binary so the kill reaches the server.
bin=$("$PY" -c 'import rerun_cli, os; print(os.path.join(os.path.dirname(rerun_cli.__file__), "rerun"))')
"$bin" --serve-web --port "$grpc" --web-viewer-port "$web" "$rrd" > "$tmp/web.log" 2>&1 &
pids+=($!)
sleep 3
url="http://127.0.0.1:$web/?url=rerun%2Bhttp%3A%2F%2F127.0.0.1%3A$grpc%2Fproxy&renderer=webgl"
DISPLAY=$display chromium --no-sandbox --disable-dev-shm-usage --enable-unsafe-swiftshader \
  --use-angle=swiftshader --window-size="${size/x/,}" --window-position=0,0 --kiosk \
  --no-first-run --user-data-dir="$tmp/chrome" "$url" > "$tmp/chrome.log" 2>&1 &
pids+=($!)
sleep "$wait_s"
DISPLAY=$display xwd -root -silent | convert xwd:- -strip -colors 128 "$out"
echo "wrote $out ($(stat -c %s "$out") bytes)"
