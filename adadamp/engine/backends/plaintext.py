"""Whether an all-reduce fit may run on a cluster: its collectives (gloo, NCCL) neither
authenticate nor encrypt, so a cluster whose Dask comm is meant to be encrypted is refused unless
the user accepts plaintext collectives (:doc:`/guide/security`)."""

from __future__ import annotations

import dask
from distributed import Client
from distributed.comm import get_address_host

from ...wire.channel import is_loopback

#: dask config key: train with plaintext collectives on a cluster whose comm is encrypted.
ALLOW_PLAINTEXT = "adadamp.allreduce.allow-plaintext"


def check_plaintext(client: Client, embedded: bool = False) -> None:
    """Refuse a cluster whose comm is TLS (or any scheme but ``tcp://``, or that requires
    encryption) unless dask config ``adadamp.allreduce.allow-plaintext`` is set: the replicas'
    collectives would send gradients, weights and optimizer state there in plaintext.  The
    embedded cluster (``embedded``) is exempt: its scheduler is on loopback, so its workers are
    local, and no other user can read their loopback traffic."""
    address = client.scheduler.address
    if dask.config.get(ALLOW_PLAINTEXT, False) or (embedded and is_loopback(get_address_host(address))):
        return
    reasons = []
    if not address.startswith("tcp://"):
        reasons.append(f"its scheduler is at {address}")
    if client.security.require_encryption or dask.config.get("distributed.comm.require-encryption", False):
        reasons.append("distributed.comm.require-encryption is set")
    if reasons:
        raise ValueError(
            f"backend='allreduce' on this cluster: {' and '.join(reasons)}, so Dask's comm is meant to be encrypted, "
            "but the replicas' collectives (gloo, NCCL) send gradients, weights and optimizer state in plaintext "
            "(this torch has no TLS transport for them). Use backend='parameter-server', which keeps every message "
            "on Dask's comm, or, where the network between the workers is trusted, accept plaintext collectives: "
            f"dask.config.set({{{ALLOW_PLAINTEXT!r}: True}})."
        )
