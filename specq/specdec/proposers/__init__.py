"""Proposers: cheap guesses of the next few tokens, verified by the target model."""

from specq.specdec.proposers.base import Draft, ProposeContext, Proposer, ProposerSession
from specq.specdec.proposers.draft_model import DraftModelProposer
from specq.specdec.proposers.medusa import MedusaHeads, MedusaProposer
from specq.specdec.proposers.ngram import NgramProposer
from specq.specdec.proposers.none import NoProposer

PROPOSERS = ("ngram", "draft", "medusa", "none")

__all__ = [
    "PROPOSERS", "Draft", "DraftModelProposer", "MedusaHeads", "MedusaProposer",
    "NgramProposer", "NoProposer", "ProposeContext", "Proposer", "ProposerSession",
]
