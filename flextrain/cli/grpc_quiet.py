"""gRPC's C core at ERROR in a ``flextrain`` process, set on import: flextrain.cli imports this module first.

A job's master (``flextrain train`` runs it in the CLI's own process) would otherwise print an INFO line
(``I1128 ... Handshake failed ... WRONG_VERSION_NUMBER``) for every plaintext client dialling a --tls job.
The core reads GRPC_VERBOSITY once, when grpc is imported, and flextrain.cli's imports import it
(flextrain.cli.kubernetes -> flextrain.k8s.tls_secret -> flextrain.protocol.security), before the command
is known: so it is set here, for whatever command this is, and taken out of the environment again, so that
the processes this one starts (workers, a script job's user code) get the environment as the user gave it.
A GRPC_VERBOSITY of the user's own (DEBUG, to see the core's lines) stands.
"""

from __future__ import annotations

import os
import sys


def quiet_grpc_core() -> None:
    if "grpc" in sys.modules or "GRPC_VERBOSITY" in os.environ:
        return  # imported already (too late to matter), or the user's own choice
    os.environ["GRPC_VERBOSITY"] = "ERROR"
    try:
        import grpc  # noqa: F401 - the core reads the verbosity now
    finally:
        del os.environ["GRPC_VERBOSITY"]


quiet_grpc_core()

__all__ = ["quiet_grpc_core"]
