"""``ray start`` for one node of the harness's local cluster, on loopback and nothing else.

Ray chooses between two behaviours with one switch, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``: off, every
Ray process takes 127.0.0.1 for its address, but ``ray start --address`` refuses to start a second
node; on, a second node starts, but every process guesses its address by a UDP connect to 8.8.8.8
and announces the machine's routable one. A node of this cluster runs with the switch off (so the
raylet, its workers and its agents stay on 127.0.0.1) and this process alone, which starts the node
with ``--node-ip-address=127.0.0.1``, lets itself start a second node and never guesses.

And no Ray Client server: ``ray start --head`` starts one on port 10001 whenever ``ray[client]``'s
packages are installed, and the harness never talks through it; one listening port fewer for other
local users to reach.
"""

import ray._private.ray_constants as ray_constants
import ray._private.services as services
import ray.scripts.scripts as scripts
import ray.util
from ray.scripts.scripts import main


def _loopback(address: str | None = None) -> str:
    return "127.0.0.1"


ray_constants.ENABLE_RAY_CLUSTER = True
services.get_node_ip_address = _loopback
ray.util.get_node_ip_address = _loopback
scripts.get_ray_client_dependency_error = lambda: ImportError("the harness's cluster runs no Ray Client server")

if __name__ == "__main__":
    main()
