-- v0.1.0 schema (sqlite): the DDL that `git show v0.1.0` ensure_schema() ran,
-- dumped from the tag's own providers (turnstile/db.py schema registry) in registration order.
-- Test data for the upgrade test; statements separated by lines holding only ';'.

CREATE TABLE IF NOT EXISTS chat_message_part (
            conversation_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            idx INTEGER NOT NULL,
            type TEXT NOT NULL,
            url TEXT,
            data TEXT,
            mime_type TEXT,
            PRIMARY KEY (conversation_id, seq, idx))
;
CREATE TABLE IF NOT EXISTS conversation (
            conversation_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            created_at TEXT NOT NULL)
;
CREATE TABLE IF NOT EXISTS chat_message (
            conversation_id TEXT NOT NULL,
            seq BIGINT NOT NULL,
            role TEXT NOT NULL,
            content TEXT,
            tool_calls TEXT,
            tool_call_id TEXT,
            is_error INTEGER NOT NULL DEFAULT 0,
            attributes TEXT,
            created_at TEXT,
            workflow_id TEXT,
            PRIMARY KEY (conversation_id, seq))
;
CREATE INDEX IF NOT EXISTS chat_message_call
            ON chat_message (conversation_id, tool_call_id)
;
CREATE TABLE IF NOT EXISTS tool_call_ledger (
            workflow_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 1,
            result TEXT,
            is_error INTEGER NOT NULL DEFAULT 0,
            outcome TEXT,
            state TEXT,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            PRIMARY KEY (workflow_id, tool_call_id))
;
CREATE TABLE IF NOT EXISTS tool_execution_log (
            execution_id TEXT PRIMARY KEY,
            workflow_id TEXT NOT NULL,
            conversation_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            input_params TEXT,
            start_time TEXT NOT NULL,
            end_time TEXT,
            status TEXT NOT NULL,
            error_message TEXT)
;
CREATE INDEX IF NOT EXISTS tool_execution_log_workflow
            ON tool_execution_log (workflow_id)
;
CREATE TABLE IF NOT EXISTS approval_decision (
            workflow_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            tool_name TEXT NOT NULL,
            approved INTEGER NOT NULL,
            reviewer TEXT NOT NULL,
            note TEXT,
            decided_at TEXT NOT NULL,
            PRIMARY KEY (workflow_id, tool_call_id))
;
CREATE TABLE IF NOT EXISTS conversation_lock (
        conversation_id TEXT PRIMARY KEY,
        workflow_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        acquired_at TEXT NOT NULL)
;
CREATE TABLE IF NOT EXISTS payload_blob (
            key TEXT PRIMARY KEY,
            data BLOB NOT NULL,
            size BIGINT NOT NULL,
            created_at TEXT NOT NULL)
;
CREATE TABLE IF NOT EXISTS payload_ref (
            key TEXT NOT NULL,
            workflow_id TEXT NOT NULL,
            PRIMARY KEY (key, workflow_id))
;
CREATE TABLE IF NOT EXISTS retrieval_document (
            service TEXT NOT NULL,
            doc_id TEXT NOT NULL,
            title TEXT NOT NULL,
            body TEXT NOT NULL,
            content_hash TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (service, doc_id))
;
CREATE VIRTUAL TABLE IF NOT EXISTS retrieval_fts USING fts5(
            service UNINDEXED, doc_id UNINDEXED, title, body,
            tokenize = 'porter unicode61')
;
CREATE TABLE IF NOT EXISTS sales_record (
            id INTEGER PRIMARY KEY,
            customer_id TEXT NOT NULL,
            customer_name TEXT NOT NULL,
            customer_email TEXT NOT NULL,
            amount_cents INTEGER NOT NULL CHECK (amount_cents >= 0),
            create_time TEXT NOT NULL
        )
;
CREATE TABLE IF NOT EXISTS follow_up_task (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            customer_id TEXT NOT NULL,
            assignee TEXT NOT NULL,
            note TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'OPEN',
            created_by_call TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (created_by_call, customer_id)
        )
;
CREATE TABLE IF NOT EXISTS email_task (
            task_id TEXT PRIMARY KEY,
            idempotency_key TEXT NOT NULL UNIQUE,
            recipient TEXT NOT NULL,
            subject TEXT NOT NULL,
            body TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            message_id TEXT NOT NULL,
            next_attempt_at TEXT,
            claimed_by TEXT,
            claimed_at TEXT,
            sent_at TEXT,
            possibly_sent INTEGER NOT NULL DEFAULT 0
        )
;
CREATE INDEX IF NOT EXISTS sales_record_time_amount_idx ON sales_record (create_time, amount_cents)
;
CREATE INDEX IF NOT EXISTS email_task_due_idx ON email_task (status, next_attempt_at)
;
CREATE TABLE IF NOT EXISTS turn_stream (
            workflow_id TEXT NOT NULL,
            response_seq BIGINT NOT NULL,
            attempt INTEGER NOT NULL,
            chunk INTEGER NOT NULL,
            text TEXT NOT NULL,
            done INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            PRIMARY KEY (workflow_id, response_seq, attempt, chunk))
;
CREATE INDEX IF NOT EXISTS turn_stream_created ON turn_stream (created_at)
;
