"""A billing run as a billing job does it: one charge per customer with the
official stripe-python SDK, pointed at Vaultcap with a vault key. Prints one
line per customer (`cust_… ch_…` or `cust_… refused <code>`).

Usage: python billing_job.py --api-base URL --key VK --period YYYY-MM
                             --customers N --amount CENTS [--prefix P]
                             [--idempotency-prefix I] [--fault F]

The idempotency key is `<I>-<customer>-<period>` (I defaults to `bill`): a
redelivery that rotates it (as the seed articles' buggy consumers do) is a
second charge for the same customer. `--fault answer_lost` asks the browser
tests' Stripe stand-in (e2e/stripe_faults.js) to make the charges and lose
their answers.
"""

import argparse

import stripe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api-base", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--period", required=True)
    parser.add_argument("--customers", type=int, required=True)
    parser.add_argument("--amount", type=int, required=True)
    parser.add_argument("--prefix", default="cust")
    parser.add_argument("--idempotency-prefix", default="bill")
    parser.add_argument("--fault")
    args = parser.parse_args()
    fault = {"fault": args.fault} if args.fault else {}

    sdk = stripe.StripeClient(args.key, base_addresses={"api": args.api_base}, max_network_retries=0)
    for n in range(args.customers):
        customer = f"{args.prefix}_{n:04d}"
        try:
            charge = sdk.v1.charges.create(
                params={
                    "amount": args.amount,
                    "currency": "usd",
                    "source": "pm_card_visa",
                    "metadata": {"customer_id": customer, "billing_period": args.period, **fault},
                },
                options={"idempotency_key": f"{args.idempotency_prefix}-{customer}-{args.period}"},
            )
            print(customer, charge.id, flush=True)
        except stripe.StripeError as error:
            print(customer, "refused", error.json_body["error"]["code"], flush=True)


if __name__ == "__main__":
    main()
