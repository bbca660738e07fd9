"""Kubernetes vocabulary shared by the operator, the master's pod backend and the CLI.

Only this package, the operator and the master's Kubernetes launch backend
import the ``kubernetes`` client, so everything else runs without a cluster.
"""
