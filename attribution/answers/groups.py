"""What an answer can group by: the one ``group_by`` rule of the summary and the series over time,
used as well by the REST API, gRPC and the CLI (which check it before asking).

``group_by`` is one of the built-in dimensions (``GROUP_BY_COLUMNS``) or ``resource.<key>``, a
resource attribute whose key is OpenTelemetry-style (letters, digits and ``. _ - /``, at most
128 characters) and is bound as a query parameter, never written into the SQL.

>>> check_group_by("resource.k8s.pod.name")
>>> group_expr("model", {})
'Model'
"""

from __future__ import annotations

import re
from typing import Any

from latscope.attribution.answers.errors import GroupByError

__all__ = ["ATTRIBUTE_KEY", "GROUP_BY_COLUMNS", "RESOURCE_GROUP", "check_group_by", "group_expr"]

#: ``group_by`` names -> SQL expression over the attribution table (and the rollup, which has
#: the same columns).
GROUP_BY_COLUMNS: dict[str, str] = {
    "service": "ServiceName",
    "model": "Model",
    "route": "Route",
    "operation": "Operation",
    "status": "StatusCode",
}
#: ``resource.<key>``: the key is the ``group_key`` parameter.
RESOURCE_GROUP = "ResourceAttributes[{group_key:String}]"
_RESOURCE_PREFIX = "resource."
#: Attribute keys a caller may name (resource and span attributes): OpenTelemetry-style names.
#: Matched whole (``fullmatch``: ``$`` alone would let a trailing newline through).
ATTRIBUTE_KEY = re.compile(r"[A-Za-z0-9_.\-/]{1,128}")


def check_group_by(group_by: str) -> None:
    """Raise ``GroupByError`` unless ``group_by`` names a built-in dimension or
    ``resource.<key>``."""
    if group_by in GROUP_BY_COLUMNS:
        return
    key = group_by.removeprefix(_RESOURCE_PREFIX)
    if group_by.startswith(_RESOURCE_PREFIX) and ATTRIBUTE_KEY.fullmatch(key):
        return
    raise GroupByError(
        f"group_by {group_by!r}: use one of {', '.join(GROUP_BY_COLUMNS)} or "
        "resource.<attribute> (e.g. resource.k8s.pod.name; letters, digits and . _ - / only, "
        "at most 128)"
    )


def group_expr(group_by: str, params: dict[str, Any]) -> str:
    """The SQL expression grouping by ``group_by`` (checked); a resource attribute's key is
    bound into ``params`` as ``group_key``."""
    check_group_by(group_by)
    if group_by in GROUP_BY_COLUMNS:
        return GROUP_BY_COLUMNS[group_by]
    params["group_key"] = group_by.removeprefix(_RESOURCE_PREFIX)
    return RESOURCE_GROUP
