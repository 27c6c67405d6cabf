"""``aiayn serve``: a trained translator behind an HTTP API with dynamic batching, and a web
page that shows the encoder-decoder attention of each translation.

    aiayn serve --checkpoint runs/demo/averaged --port 8000
    curl -s localhost:8000/translate -H 'Content-Type: application/json' -d '{"text": ["Hello."]}'

``batcher`` groups concurrent requests for one worker thread; ``translator`` turns a checkpoint
into answers with the library's decoding; ``app`` holds the routes, limits and errors.
"""

from .app import Limits, TranslateRequest, create_app, run_server
from .batcher import Batcher, BatchStats, ShuttingDown
from .translator import TranslateJob, Translator

__all__ = [
    "BatchStats",
    "Batcher",
    "Limits",
    "ShuttingDown",
    "TranslateJob",
    "TranslateRequest",
    "Translator",
    "create_app",
    "run_server",
]
