"""vllm-router started with the workers' API key from the environment, never from its command line.

``python -m serving.router_main ARGS`` parses ARGS with vllm-router's own parser
(``vllm_router.launch_router.parse_router_args``), sets its ``api_key`` (the key it uses for its own
calls to the workers) from ``$VLLM_API_KEY`` and starts the router in this process. vllm-router
itself takes the key only as ``--api-key KEY``, which every local user would read in ``ps``.

Clients' requests carry their own ``Authorization`` header, which the router passes on to the
worker; the workers (vLLM started with the key) answer 401 to a request without it.
"""

from __future__ import annotations

import os
import sys

from serving.secrets import SERVER_KEY_ENV


def main(argv: list[str] | None = None) -> None:
    from vllm_router.launch_router import launch_router, parse_router_args

    args = parse_router_args(sys.argv[1:] if argv is None else argv)
    args.api_key = os.environ.pop(SERVER_KEY_ENV, None) or None
    launch_router(args)


if __name__ == "__main__":
    main()
