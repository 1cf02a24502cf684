package azure

import (
	"context"
	"fmt"
	"sort"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azqueue"

	"github.com/asyncplatform/asyncplatform/driver"
)

var _ driver.QueueLister = (*Backend)(nil)

// nameMeta is the metadata of a work queue whose base is hashed: the facade
// queue's name, which the base cannot give back.
const nameMeta = "apqueue"

// label writes the facade name on the work queue of a queue whose base is
// hashed, so that Queues can name it; Declare calls it. A readable base is
// the name itself and needs none.
func (b *Backend) label(ctx context.Context, queue string) error {
	if baseName(queue) == queue {
		return nil
	}
	work := b.names(queue).work
	_, err := b.svc.NewQueueClient(work).SetMetadata(ctx, &azqueue.SetMetadataOptions{Metadata: map[string]*string{nameMeta: &queue}})
	if err != nil {
		return fmt.Errorf("azure: label queue %s: %w", work, err)
	}
	return nil
}

// Queues implements driver.QueueLister: one listing of the work queues
// (<prefix>w*, 5,000 a page, with their metadata). A readable base is the
// queue's name; a hashed one is named by its label, which must hash to it.
// Every queue has its work queue from Declare on, so the dead letters are
// not looked at: a queue holding only dead letters is found by its work
// queue too.
func (b *Backend) Queues(ctx context.Context) ([]string, error) {
	if b.isClosed() {
		return nil, driver.ErrClosed
	}
	prefix := b.prefix + "w"
	var names []string
	pager := b.svc.NewListQueuesPager(&azqueue.ListQueuesOptions{Prefix: &prefix, Include: azqueue.ListQueuesInclude{Metadata: true}})
	for pager.More() {
		resp, err := pager.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("azure: list queues %s*: %w", prefix, err)
		}
		for _, q := range resp.Queues {
			if q.Name == nil || len(*q.Name) <= len(prefix) {
				continue
			}
			base := (*q.Name)[len(prefix):]
			name := base
			if hashedBaseRe.MatchString(base) {
				v := q.Metadata[nameMeta]
				if v == nil {
					continue // declared by a version that did not label it
				}
				name = *v
			}
			if driver.CheckQueue(name) == nil && baseName(name) == base {
				names = append(names, name)
			}
		}
	}
	sort.Strings(names)
	return names, nil
}
