"""Provenance: signed in-toto statements of how an env was built (SLSA provenance v1) and what was witnessed
inside it (envport's witness predicate), stored in the SIF next to its signature and SBOM (docs/provenance.md).

- statement.py: the in-toto Statement v1 (built as JSON, validated with the in-toto-attestation library);
- slsa.py: the SLSA provenance v1 predicate of a build;
- witness.py: the witness predicate of a witness run;
- envelope.py: the DSSE envelope (payloadType application/vnd.in-toto+json), signed with `envport sign`'s keys;
- store.py: statements as SIF objects outside every object group;
- judge.py: each statement read back and judged (signer, subject digest), and the site's require_witnessed.
"""
