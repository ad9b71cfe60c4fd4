"""The proposers' names, in a module of their own: the command line lists them as
choices without importing the proposers (and through them the model and numba), so
that every command starts in a fraction of a second."""

PROPOSERS = ("auto", "hybrid", "ngram", "medusa", "draft", "none")
