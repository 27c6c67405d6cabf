"""``aiayn serve``: a trained translator behind an HTTP API with dynamic batching, and a web
page that shows the encoder-decoder attention of each translation.

    aiayn serve --checkpoint runs/demo/averaged --port 8000
    curl -s localhost:8000/translate -H 'Content-Type: application/json' -d '{"text": ["Hello."]}'

``batcher`` groups concurrent requests for one worker thread; ``adapter`` turns an
``aiayn.Translator``'s answers into JSON; ``app`` holds the routes, limits and errors;
``server`` runs the app under uvicorn with its timeouts and shutdown.
"""

from .adapter import Adapter, TranslateJob
from .app import Limits, TranslateRequest, create_app
from .batcher import Batcher, BatchStats, DeadlinePassed, Overloaded, QueueFull, ShuttingDown
from .server import make_server, run_server

__all__ = [
    "Adapter",
    "BatchStats",
    "Batcher",
    "DeadlinePassed",
    "Limits",
    "Overloaded",
    "QueueFull",
    "ShuttingDown",
    "TranslateJob",
    "TranslateRequest",
    "create_app",
    "make_server",
    "run_server",
]
