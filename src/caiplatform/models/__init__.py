"""The typed contract of the five APIs: one module per area, request and response models.

Services take and return these, the server declares them in `/openapi.json`, and the remote client hands
the same objects to its callers: `from caiplatform.models.vector import IndexCreate, Index`. The bases are
in `caiplatform.models.base`.
"""

from caiplatform.models.base import ListPage, OpenResponseModel, RequestModel, ResponseModel

__all__ = ["ListPage", "OpenResponseModel", "RequestModel", "ResponseModel"]
