"""Training Medusa heads by self-distillation: the target model answers a prompt
corpus (distill), its final hidden states over those answers are collected
(features), and the heads learn to predict the answers' later tokens (heads)."""
