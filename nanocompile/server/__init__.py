"""`nanocompile serve`: an OpenAI-compatible HTTP server for one model (FastAPI on uvicorn).

app.create_app builds the application around a nanocompile.Model; engine.Engine runs its
generations one at a time in a worker thread, from a bounded queue.
"""
from .app import create_app

__all__ = ["create_app"]
