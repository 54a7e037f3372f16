"""Interpreters over the op table: one block, one program, an SPMD process grid."""
