package rowactor

import (
	"context"
	"encoding/json"
	"fmt"
)

// JSON adapts a function of a typed message to a Handler. Each row's payload is decoded
// from JSON into a T by encoding/json's rules. Unknown fields are ignored, so producers
// may add fields before consumers know them. Then f runs as a Func handler would: nil
// acks, an error fails with the retry policy's backoff, and an Outcome returned as an
// error settles by it.
//
// A payload that does not decode into a T is sent to its dead letter, as DeadLetter
// does: it would not decode on any retry either. It goes to the dead letter at once, or
// is dropped when the subscription has none, with the decoding error kept as its error.
func JSON[T any](f func(ctx context.Context, d *Delivery, msg T) error) Handler {
	if f == nil {
		return nil // Subscribe refuses a nil handler by name
	}
	return Func(func(ctx context.Context, d *Delivery) error {
		var msg T
		if err := json.Unmarshal(d.Payload(), &msg); err != nil {
			return DeadLetter(fmt.Errorf("rowactor: the payload of row %d is not the JSON of a %T: %w", d.ID(), msg, err))
		}
		return f(ctx, d, msg)
	})
}

// PublishJSON publishes v encoded as JSON by encoding/json, as Publish does a payload. A
// value that cannot be encoded is an error, and nothing is published.
func PublishJSON[T any](ctx context.Context, b *Broker, t Table, queue string, v T, opts ...PublishOption) (int64, error) {
	payload, err := encodeJSON(t, v)
	if err != nil {
		return 0, err
	}
	return b.Publish(ctx, t, queue, payload, opts...)
}

// PublishJSONTx publishes v encoded as JSON in the service's own transaction, as PublishTx
// does a payload.
func PublishJSONTx[T any](ctx context.Context, b *Broker, tx any, t Table, queue string, v T, opts ...PublishOption) (int64, error) {
	payload, err := encodeJSON(t, v)
	if err != nil {
		return 0, err
	}
	return b.PublishTx(ctx, tx, t, queue, payload, opts...)
}

func encodeJSON[T any](t Table, v T) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("rowactor: publish to %s: encode a %T as JSON: %w", t.Name, v, err)
	}
	return payload, nil
}
