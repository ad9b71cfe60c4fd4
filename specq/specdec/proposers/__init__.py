"""Proposers: cheap guesses of the next few tokens, verified by the target model."""

# "auto": heads with prompt lookup (hybrid) when heads that fit the model are given
# or shipped, prompt lookup alone otherwise. "medusa" and "hybrid" take either kind
# of heads file (Medusa heads or a recurrent head): the file says which it is.
from specq.specdec.proposer_names import PROPOSERS
from specq.specdec.proposers.base import Draft, ProposeContext, Proposer, ProposerSession
from specq.specdec.proposers.draft_model import DraftModelProposer
from specq.specdec.proposers.hybrid import HybridProposer
from specq.specdec.proposers.medusa import MedusaHeads, MedusaProposer
from specq.specdec.proposers.ngram import NgramProposer
from specq.specdec.proposers.none import NoProposer
from specq.specdec.proposers.recurrent import RecurrentHead, RecurrentHeadProposer

__all__ = [
    "PROPOSERS",
    "Draft",
    "DraftModelProposer",
    "HybridProposer",
    "MedusaHeads",
    "MedusaProposer",
    "NgramProposer",
    "NoProposer",
    "ProposeContext",
    "Proposer",
    "ProposerSession",
    "RecurrentHead",
    "RecurrentHeadProposer",
]
