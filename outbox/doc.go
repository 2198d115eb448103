// Package outbox is rowactor's transactional outbox: a service records a message in the
// same transaction as the business change that causes it, and a relay sends it on, so the
// message exists if and only if the change committed, and is sent at least once.
//
// # The three parts
//
// The outbox table is the service's own (describe it with Table; Schema renders its
// CREATE TABLE for the dialect). Record inserts a record in the caller's transaction
// (pgx.Tx on PostgreSQL, *sql.Tx on MySQL/MariaDB and SQLite), so a rolled-back
// transaction leaves no record and nothing is ever sent for it.
//
// The relay (StartRelay) is one Proto.Actor actor per outbox: it hands every unsent record
// to a Sink, in id order, with the record's id in the IDHeader header, and stamps its
// sent_at. It looks every poll interval, and at once when told (Wake, after the caller's
// commit). When it starts it first sends again every record still unprocessed, sent or
// not, so a record whose delivery was lost anywhere downstream (a relay killed between the
// send and the stamp, a consumer that retried, a queue row lost with its database) is
// delivered again. A failing database or sink never crashes the service and never spins: a
// failed round is retried by a worker actor restarted after a capped, jittered backoff
// (package supervision), from the first record still unsent.
//
// The consumer settles the record by its handler's outcome: Outbox.Handler wraps a
// rowactor.Handler so that Ack and Drop stamp the record's processed_at (in the outbox's
// database), Retry and RetryAfter leave it unprocessed for the next relay start, and a
// record already processed is acked without running the handler. A record is stamped only
// once the handler's effect committed: at once outside transactional mode, after the
// queue's settlement in a Transactional subscription, whose broker must then be given
// rowactor.WithOnSettled(ob.Settled). Several consumer brokers may share ob.Handler and
// ob.Settled (stamps are matched by broker, table and row), or each take a Consumer of its
// own (ob.Consumer()). NewQueueSink delivers records into a rowactor queue table
// (on any database) through a *rowactor.Broker.
//
//	ob, err := outbox.New(ctx, ordersDialect, events)            // the outbox's database
//	id, err := ob.Record(ctx, tx, "order.created", payload, nil)  // in the business tx
//	// ... tx.Commit(); ob.Wake()
//	relay, err := ob.StartRelay(sink)                            // one per outbox
//	b, err := rowactor.New(shippingDialect, rowactor.WithOnSettled(ob.Settled))
//	sub, err := b.Subscribe(ctx, jobs, "order.created", ob.Handler(handle), rowactor.Transactional())
//
// # Record ids
//
// Consumers recognise a record by its id, so the database must never hand an id out
// again, even after processed records are purged: New refuses a table whose ids can be
// reused (SQLite without AUTOINCREMENT, a PostgreSQL id without a sequence or with a
// cycling one, a MySQL/MariaDB id without AUTO_INCREMENT or outside InnoDB), naming the
// table, the column and the fix. Schema renders a table New accepts.
//
// # Tracing
//
// Record keeps the trace context of its ctx's span in the record's traceparent header
// (unless the record's headers carry one of their own), and the relay hands its sink a
// context whose parent is the record's trace context: a QueueSink's publish, and the
// consumer's span after it, join the trace of the request that recorded the record.
//
// # Delivery guarantee
//
// At least once: a record is sent before it is stamped sent, and stays unprocessed until
// a consumer acks it, so a crash anywhere sends it again, and two relays started at once
// on one table (in two processes) may both send it. A consumer whose effect must happen
// once checks the record's id with a Dedupe inside the transaction that makes the effect:
// the first delivery inserts the id and makes the effect, a second finds the id and skips.
//
// # Costs
//
// Record: one INSERT in the caller's transaction. Relay: one SELECT per poll (of up to
// BatchSize unsent records, through a partial index of the unsent ones), then per record
// one Sink.Send and one UPDATE; nothing when the outbox is idle but that SELECT. Consumer:
// one SELECT of the record before the handler and one UPDATE after an Ack or Drop, each
// on a pool connection of the outbox's database taken only for the statement. Every
// statement is built, and prepared against the live table, once per outbox.
package outbox
