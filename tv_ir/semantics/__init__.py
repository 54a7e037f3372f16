"""What programs mean: element algebras, symbolic terms, the op table, the interpreters, layouts."""
