"""Drafter training recipe: on-policy data generation, training and teacher-forced evaluation."""
