"""Evaluation of sentence encoders."""
