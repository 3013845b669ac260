import { connect, type ChannelModel, type Options } from 'amqplib';
import { DedupError } from '../errors.js';
import { errorText, withTimeout } from './util.js';

/**
 * Connects to RabbitMQ over AMQP 0-9-1 with a bounded wait, and wires the connection's events:
 * amqplib emits 'error' before 'close', and an unhandled 'error' event would kill the process.
 *
 * @throws DedupError `DEDUP_BROKER_UNREACHABLE`.
 */
export async function connectAmqp(
  url: string | Options.Connect,
  timeoutMs: number,
  onClose: () => void,
): Promise<ChannelModel> {
  let model: ChannelModel;
  try {
    model = await withTimeout(connect(url), timeoutMs, 'connecting');
  } catch (err) {
    throw new DedupError(
      'DEDUP_BROKER_UNREACHABLE',
      `cannot connect to RabbitMQ over AMQP 0-9-1: ${errorText(err)}`,
      {
        cause: err,
      },
    );
  }
  model.on('error', () => undefined);
  model.on('close', onClose);
  return model;
}
