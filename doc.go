// Package rowactor turns a service's own SQL tables into work queues consumed by actors.
//
// Point a [Broker] at a table in SQLite, embedded with no server, in PostgreSQL or in
// MySQL/MariaDB, mount a [Handler] with [Broker.Subscribe], and rowactor claims due rows,
// runs the handler once per row, and settles each row by the [Outcome] it returns. Retries,
// delays and dead letters live in the table itself: there is no broker process to run,
// and a job's fate is decided in the same database, often in the same transaction, as the
// data it touches.
//
// # The smallest program
//
// A queue of emails in a SQLite file, from [Open] to [Broker.Shutdown]. This is
// examples/hello, which CI runs:
//
//	func main() {
//		if err := run(context.Background()); err != nil {
//			log.Fatal(err)
//		}
//	}
//
//	func run(ctx context.Context) error {
//		dir, err := os.MkdirTemp("", "hello-")
//		if err != nil {
//			return err
//		}
//		defer os.RemoveAll(dir) // its error unchecked: what it leaves is in the system's temporary directory
//		b, err := rowactor.Open(ctx, "sqlite:"+filepath.Join(dir, "jobs.db"))
//		if err != nil {
//			return err
//		}
//
//		// The columns named choose the claim form: LockedUntil is the lease form.
//		emails := rowactor.Table{Name: "email_jobs", ID: "id", Payload: "payload",
//			Attempt: "attempt", RetryAfter: "retry_after", LockedUntil: "locked_until"}
//		if err := b.ApplySchema(ctx, emails); err != nil { // CREATE TABLE and its claim index, once
//			return err
//		}
//
//		sent := make(chan struct{})
//		_, err = b.Subscribe(ctx, emails, "", rowactor.JSON(func(ctx context.Context, d *rowactor.Delivery, m Email) error {
//			fmt.Println("sending to", m.To, "on attempt", d.Attempt())
//			close(sent)
//			return nil // acks: the row is deleted; an error would retry it after a backoff
//		}))
//		if err != nil {
//			return err
//		}
//		if _, err := rowactor.PublishJSON(ctx, b, emails, "", Email{To: "a@example.com"}); err != nil {
//			return err
//		}
//		<-sent
//		report, err := b.Shutdown(ctx) // waits for the settlement
//		if err != nil {
//			return err
//		}
//		fmt.Println("drained:", report.Drained)
//		return nil
//	}
//
// A database's dialect registers itself when its package is imported, as database/sql
// drivers do: dialects/sqlite, dialects/postgres or dialects/mysql.
//
// # The three claim forms
//
// A [Table] describes the queue table by its own column names; which columns it names
// picks how a row is claimed:
//
//   - Row lock, when the table names neither LockedUntil nor AdvisoryKey; PostgreSQL and
//     MySQL/MariaDB only. The claim's transaction holds SELECT … FOR UPDATE SKIP LOCKED
//     while the handler runs, and its COMMIT is the settlement. A crashed process's rows
//     return at once.
//   - Lease, when the table names LockedUntil. The claim writes an expiry, renewed while
//     the handler runs. Every settlement names that expiry, so a row whose lease ran out
//     and was claimed again cannot be settled by its old holder. It holds no connection
//     while handlers run.
//   - Advisory lock, when the table names AdvisoryKey, a template such as
//     "accounts-{account_id}". Rows with equal keys are worked one at a time, by a
//     session lock held during the handler.
//
// # Handlers and outcomes
//
// A handler returns one of these outcomes:
//
//   - [Ack] deletes the row, or stamps ProcessedAt; [Drop] ends it as well.
//   - [Retry] and [RetryAfter] give it back to the queue, at once or later.
//   - [Fail] gives it back after the delay the retry policy picks.
//   - [Snooze] gives it back for later, without spending an attempt.
//   - [Cancel] ends it as cancelled, as [Broker.Cancel] does: dropped, its reason kept.
//   - [DeadLetter] moves it to its dead letter at once, else drops it.
//
// [JSON] and [Func] adapt handlers that decode a payload or return an error. After
// [MaxAttempts] a failing row moves to its dead letter, a [DeadLetterGroup] or a
// [DeadLetterTable]. [Transactional] lends each delivery a transaction that commits with
// its Ack. A handler's panic is recovered, logged with its stack, and gives its one row
// back.
//
// # Where to read on
//
// README.md shows the API by task; docs/forms.md compares the claim forms,
// docs/transactional.md the transactional mode, docs/reliability.md what is promised
// under faults and how bench/chaos checks it, docs/operations.md running it in production,
// docs/periodic.md periodic jobs, docs/outbox.md the transactional outbox, and
// docs/testing.md the test kit, package rowactortest. The packages actors, claimer,
// leaserenewer, settler and supervision are rowactor's engine, used by this package, with
// no compatibility promise; dialects is the interface each database implements.
package rowactor
