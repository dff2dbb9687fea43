"""Agent Cards as versioned, content-addressed dependencies (rules R2, R3, R7, R9, R14). Pure:
this wing parses and decides, and reads nothing (card reads are the discovery wing's).

``model`` parses untrusted bytes into one card model for A2A 1.0 and 0.3 cards; ``spoken`` says
what cardfence speaks (bindings, A2A versions, media types), ``urls`` where it may speak (the one
URL rule, R16; the origin an agent is known by), ``interfaces`` which of a card's interfaces it
talks to; ``canonical`` decodes card JSON and computes the RFC 8785 hashes, ``fields`` reads typed
fields, ``diff`` names what changed between two revisions; ``signature_policy`` says whose card
signatures are checked and how, ``keys`` parses the key sets they are checked with, and
``signatures`` verifies signed cards.
"""
