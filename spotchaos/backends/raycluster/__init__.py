"""The Ray backend (``spotchaos[ray]``): attempts on the worker nodes of a Ray cluster, faults as
a spot reclaim reaches a Ray node (a drain with the grace window, the node gone).

``cluster``: the cluster, local (started, replaced and ended by the harness) or the user's;
``backend``: placement and the handle the engine drives; ``agent``: the actor on a node that starts
the job there; ``node_main``: ``ray start`` pinned to loopback. Importing this package imports no
Ray: that happens when a cluster is opened.
"""

from __future__ import annotations

from .backend import RayBackend, RayHandle
from .cluster import LocalRayCluster, RayCluster, RemoteRayCluster, cluster_for

__all__ = ["LocalRayCluster", "RayBackend", "RayCluster", "RayHandle", "RemoteRayCluster", "cluster_for"]
