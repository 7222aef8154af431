"""The REST front door (FastAPI): `create_app(settings)` builds the app; models load in its lifespan."""

from service.http_api.app import create_app

__all__ = ["create_app"]
