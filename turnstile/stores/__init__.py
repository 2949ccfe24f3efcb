"""The stores: everything a turn keeps in the database — the connection
factory and schema, chat memory and the tool-call ledger, the audit log, the
conversation lock, the claim-check payload store, streamed text and the
retrieval index. Stores import only the engine.
"""
