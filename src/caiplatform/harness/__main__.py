"""`python -m caiplatform.harness`: serve the agent described by the environment on 127.0.0.1:$PORT."""

from __future__ import annotations

import logging
import os

from caiplatform.harness.app import create_harness_app
from caiplatform_server import serving


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_harness_app(dict(os.environ))
    port = int(os.environ.get("PORT") or 8080)
    # Access lines and start-up go to the instance's output, which the runtime keeps as the agent's logs.
    serving.run(app, host=os.environ.get("CAI_HARNESS_HOST", "127.0.0.1"), port=port, log_level="info",
                access_log=True)


if __name__ == "__main__":
    main()
