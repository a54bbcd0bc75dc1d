"""The OIP v2 REST protocol: routes (``app.py``), bodies (``codec.py``) and the HTTP/1.1 limits
uvicorn's stock settings lack (``limits.py``)."""

from offload.serve.rest.app import rest_app

__all__ = ["rest_app"]
