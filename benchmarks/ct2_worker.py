"""CTranslate2 in a process of its own, for ``decode_throughput.py``.

CTranslate2 brings its own OpenMP runtime and thread pool; sharing a process with PyTorch's
would let one slow the other. The parent sends one JSON request per line on stdin and reads
one JSON answer per line: {"sources": [[token, ...], ...], "batch": 32, "beam": 4,
"min_len": 40, "max_len": 40} -> {"seconds": ..., "outputs": [[token, ...], ...]}.
Never imports torch.

    python benchmarks/ct2_worker.py CT2_MODEL_DIR float32|int8 THREADS [REPLICAS [DEVICE]]

REPLICAS (default 1): translators searching batches side by side (``inter_threads``), the
THREADS shared among them. DEVICE: cpu (default) or cuda (``gpu_check.py``).
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import ctranslate2

    model_dir, compute_type, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    replicas = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    translator = ctranslate2.Translator(
        model_dir,
        device=device,
        compute_type=compute_type,
        intra_threads=max(1, threads // replicas),
        inter_threads=replicas,
    )
    for line in sys.stdin:
        req = json.loads(line)
        start = time.perf_counter()
        results = translator.translate_batch(
            req["sources"],
            beam_size=req["beam"],
            max_batch_size=req["batch"],
            min_decoding_length=req.get("min_len", 0),
            max_decoding_length=req["max_len"],
            length_penalty=req.get("length_penalty", 0.6),
            patience=req.get("patience", 1.0),
        )
        seconds = time.perf_counter() - start
        print(
            json.dumps({"seconds": seconds, "outputs": [r.hypotheses[0] for r in results]}),
            flush=True,
        )


if __name__ == "__main__":
    main()
