"""The /mcp front door, a stack of small ASGI parts (kdbl_api.front_door.stack lists them in order).

What the rest of the API uses: `McpFrontDoor` (the composed app; its `authenticate` is every route's token
check), `read_body` and `replay` (the legacy SSE transport sends its messages through the door in-process),
`disabled_message`, and `PRM_PATH` / `public_base` (the protected-resource metadata the 401 challenge names).
"""

from kdbl_api.front_door.asgi import replay
from kdbl_api.front_door.envelope import read_body
from kdbl_api.front_door.refusals import PRM_PATH, disabled_message, public_base
from kdbl_api.front_door.stack import McpFrontDoor

__all__ = ["PRM_PATH", "McpFrontDoor", "disabled_message", "public_base", "read_body", "replay"]
