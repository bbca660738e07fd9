"""A member that never arrives while a round's group forms is given up after FORM_TIMEOUT, not after
the collective timeout (a dead peer cannot break a connection it never opened)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from flextrain.worker import collective as collective_module
from flextrain.worker.collective import Collective, CollectiveError


def test_a_member_missing_from_the_forming_round_fails_it_at_the_form_timeout(monkeypatch):
    monkeypatch.setattr(collective_module, "FORM_TIMEOUT", timedelta(seconds=1))
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    collective = Collective(timeout=600.0)  # a long collective timeout: the form timeout must apply
    with pytest.raises(CollectiveError, match="forming round 3 failed"):
        collective.join_round(host="127.0.0.1", port=store.port, round_id=3, rank=0, world_size=2)
    assert not dist.is_initialized()  # torn down: the next round starts clean
