"""``aiayn serve``: a trained translator behind an HTTP API with dynamic batching, and a web
page that shows the encoder-decoder attention of each translation.

    aiayn serve --checkpoint runs/demo/averaged --port 8000
    curl -s localhost:8000/translate -H 'Content-Type: application/json' -d '{"text": ["Hello."]}'

``batcher`` groups concurrent requests for one worker thread; ``translator`` turns a checkpoint
into answers with the library's decoding; ``app`` holds the routes, limits and errors;
``server`` runs the app under uvicorn with its timeouts and shutdown.
"""

from .app import Limits, TranslateRequest, create_app
from .batcher import Batcher, BatchStats, DeadlinePassed, Overloaded, QueueFull, ShuttingDown
from .server import make_server, run_server
from .translator import TranslateJob, Translator

__all__ = [
    "BatchStats",
    "Batcher",
    "DeadlinePassed",
    "Limits",
    "Overloaded",
    "QueueFull",
    "ShuttingDown",
    "TranslateJob",
    "TranslateRequest",
    "Translator",
    "create_app",
    "make_server",
    "run_server",
]
