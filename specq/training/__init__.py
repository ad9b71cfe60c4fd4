"""Training heads by self-distillation: the target model answers a prompt corpus
(distill), its final hidden states over those answers are collected (features), and
a recurrent head (recurrent, gate) or Medusa heads (heads, tree_shape) learn to
predict the answers' later tokens."""
