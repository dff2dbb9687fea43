"""Agent Cards as versioned, content-addressed dependencies (rules R2, R3, R7, R9, R14).

``model`` parses untrusted bytes into one card model for A2A 1.0 and 0.3 cards, ``interfaces``
says which of a card's interfaces cardfence talks to and in what (bindings, versions, media types,
the URL rule), ``canonical`` decodes card JSON and computes the RFC 8785 hashes, ``diff`` names
what changed between two revisions, ``history`` lists the revisions a store has seen,
``signature_policy`` says whose card signatures are checked and how, ``keys`` reads the key sets
they are checked with, ``signatures`` verifies signed cards, ``fetch`` makes one bounded,
conditional GET of a card, and ``discovery`` reads cards through it: memoised where allowed,
recorded in the agent's stream (``agent_stream``), with the contract and key set pinned per agent
(``signed_reads`` finds, reads and pins the key sets).
"""
