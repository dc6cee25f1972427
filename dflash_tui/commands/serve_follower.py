"""`serve --distributed` on a rank other than 0: no HTTP, the same engine loop run headless
for every request rank 0 hands over (engine/rank_channel.py), until rank 0 shuts down.

A follower prints nothing: rank 0 reports what went wrong (a failure of this rank alone
is reported by it, `Ranks.follower_failed`). It never waits forever: a
rank 0 that dies fails the next collective, one that hangs stops the heartbeats and the
watchdog ends this process.
"""

from __future__ import annotations

import argparse

from dflash_tui.engine.distributed import Ranks
from dflash_tui.errors import UserError


def follow_rank_0(args: argparse.Namespace, ranks: Ranks) -> int:
    from dflash_tui.commands.common import resolve_pair
    from dflash_tui.engine.conversation import Conversation
    from dflash_tui.engine.loading import load_pair
    from dflash_tui.engine.rank_channel import Channel, follow

    try:
        model, draft = resolve_pair(args)
        pair = load_pair(model, draft, trust_remote_code=args.trust_remote_code, require_draft=False, ranks=ranks,
                         draft_quant=args.draft_quant or 0)  # the same draft on every rank: the same proposals
        conversation = Conversation(pair)
        conversation.ranks = ranks
        follow(conversation, Channel(ranks))
    except UserError as exc:
        ranks.follower_failed(exc)
    return 0
